"""The stack classifier and its class table (share/stacks/classes.toml)."""

from __future__ import annotations

import pytest

from slurm_gpu.capture.stackclass import (
    OTHER,
    SLEEP_IDLE,
    Frame,
    TableError,
    classify,
    frame_name,
    load_table,
    parse_table,
    role_of,
)

TABLE = load_table()
LIB = "/usr/lib/python3.11"
TORCH = "/opt/venv/lib/python3.11/site-packages/torch"


def stack(*frames: tuple[str, str]) -> list[Frame]:
    """Innermost first, as py-spy gives them."""
    return [Frame(file, func) for file, func in frames]


MAIN = ("/home/alice/train.py", "main")
TRAIN = ("/home/alice/train.py", "train")


@pytest.mark.parametrize(
    ("frames", "active", "cls", "deciding"),
    [
        # PyTorch: the main process waits for the next batch from its workers.
        (
            stack(
                (f"{LIB}/multiprocessing/connection.py", "_recv"),
                (f"{LIB}/multiprocessing/connection.py", "recv_bytes"),
                (f"{LIB}/queue.py", "get"),
                (f"{TORCH}/utils/data/dataloader.py", "_try_get_data"),
                (f"{TORCH}/utils/data/dataloader.py", "__next__"),
                TRAIN,
                MAIN,
            ),
            False,
            "input_wait",
            "connection._recv",
        ),
        # Plain Python: a main loop waiting on a multiprocessing queue fed by workers.
        (
            stack((f"{LIB}/multiprocessing/queues.py", "get"), TRAIN, MAIN),
            False,
            "input_wait",
            "queues.get",
        ),
        # A checkpoint: torch.save, whatever it calls inside.
        (
            stack(
                (f"{LIB}/zipfile.py", "write"),
                (f"{TORCH}/serialization.py", "_save"),
                (f"{TORCH}/serialization.py", "save"),
                TRAIN,
                MAIN,
            ),
            True,
            "checkpoint_io",
            "zipfile.write",
        ),
        # An all-reduce inside backward: the collective wins over compute.
        (
            stack(
                (f"{TORCH}/distributed/distributed_c10d.py", "all_reduce"),
                (f"{TORCH}/distributed/c10d_logger.py", "wrapper"),
                ("/home/alice/model.py", "sync_grads"),
                (f"{TORCH}/autograd/__init__.py", "backward"),
                TRAIN,
            ),
            False,
            "collective",
            "distributed_c10d.all_reduce",
        ),
        (
            stack(
                ("/home/alice/model.py", "forward"),
                (f"{TORCH}/nn/modules/module.py", "_call_impl"),
                TRAIN,
            ),
            True,
            "compute",
            "model.forward",
        ),
        (
            stack((f"{TORCH}/optim/adam.py", "step"), TRAIN),
            True,
            "compute",
            "adam.step",
        ),
        # JAX
        (
            stack(("/x/site-packages/jax/_src/array.py", "block_until_ready"), TRAIN),
            False,
            "compute",
            "array.block_until_ready",
        ),
        (
            stack(("/x/site-packages/jax/_src/api.py", "device_put"), TRAIN),
            True,
            "h2d_copy",
            "api.device_put",
        ),
        # Evaluation beats compute (the forward inside it).
        (
            stack(
                (f"{TORCH}/nn/modules/module.py", "_call_impl"),
                ("/home/alice/train.py", "evaluate"),
                MAIN,
            ),
            True,
            "evaluation",
            "train.evaluate",
        ),
        # A wait in threading: sleeping.
        (
            stack((f"{LIB}/threading.py", "wait"), MAIN),
            False,
            SLEEP_IDLE,
            "threading.wait",
        ),
        # No rule: an idle thread is sleeping (time.sleep is C, not a frame), a running one other.
        (stack(TRAIN, MAIN), False, SLEEP_IDLE, ""),
        (stack(TRAIN, MAIN), True, OTHER, ""),
        (stack(TRAIN, MAIN), None, OTHER, ""),
    ],
)
def test_stacks_are_classified_with_the_deciding_frame(
    frames: list[Frame], active: bool | None, cls: str, deciding: str
) -> None:
    verdict = classify(frames, active, TABLE)
    assert (verdict.cls, verdict.deciding) == (cls, deciding)


def test_json_dump_of_a_large_object_is_a_checkpoint_write() -> None:
    """What py-spy 0.4.3 returned (Python 3.11) for ``json.dump`` of a 2 MB object, in 4 of 5
    samples: the running encoder generators without their caller (no ``json.dump`` frame)."""
    enc = f"{LIB}/json/encoder.py"
    samples = [
        stack((enc, "_make_iterencode.<locals>._iterencode_list")),
        stack(
            (enc, "_make_iterencode.<locals>._iterencode_list"),
            (enc, "_make_iterencode.<locals>._iterencode_dict"),
            (enc, "_make_iterencode.<locals>._iterencode"),
        ),
        stack((enc, "JSONEncoder.iterencode.<locals>.floatstr"), (enc, "_iterencode_list")),
    ]
    verdicts = [classify(frames, True, TABLE) for frames in samples]
    assert [v.cls for v in verdicts] == ["checkpoint_io"] * 3
    assert verdicts[0].deciding == "encoder._iterencode_list"


def test_connection_recv_counts_as_input_only_under_a_loader() -> None:
    frames = stack((f"{LIB}/multiprocessing/connection.py", "recv"), TRAIN, MAIN)
    assert classify(frames, True, TABLE).cls == OTHER


def test_roles() -> None:
    worker = stack(
        ("/home/alice/data.py", "__getitem__"),
        (f"{TORCH}/utils/data/_utils/worker.py", "_worker_loop"),
        (f"{LIB}/multiprocessing/process.py", "run"),
        (f"{LIB}/multiprocessing/process.py", "_bootstrap"),
    )
    assert role_of(worker, TABLE) == "worker"
    child = stack(("/home/alice/w.py", "work"), (f"{LIB}/multiprocessing/process.py", "_bootstrap"))
    assert role_of(child, TABLE) == "child"
    launcher = stack((f"{TORCH}/distributed/elastic/agent/server/api.py", "_invoke_run"))
    assert role_of(launcher, TABLE) == "launcher"
    assert role_of(stack(TRAIN, MAIN), TABLE) is None


def test_deciding_names_are_cleaned_and_bounded() -> None:
    name = frame_name(Frame("/home/eve/\x1b[31mx.py", "f\nake" + "y" * 200))
    assert "\x1b" not in name and "\n" not in name
    assert len(name) <= 64


def test_the_site_table_extends_the_shipped_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site.toml"
    site.write_text(
        '[[class]]\nname = "tokenize"\npriority = 15\ndescription = "tokenizing"\n'
        '[[rule]]\nclass = "tokenize"\nfile = "tokenizers/"\n'
        '[[rule]]\nclass = "compute"\nfunction = ["my_step"]\n'
    )
    table = load_table(str(site))
    assert table.classes.index("tokenize") < table.classes.index("input_wait")
    assert table.classes[-1] == OTHER
    got = classify(stack(("/x/tokenizers/enc.py", "encode"), TRAIN), True, table)
    assert got.cls == "tokenize"
    assert classify(stack(("/home/a/t.py", "my_step"), MAIN), True, table).cls == "compute"


@pytest.mark.parametrize(
    "text",
    [
        '[[rule]]\nclass = "nope"\nfile = "x"\n',
        '[[rule]]\nclass = "compute"\n',
        '[[rule]]\nclass = "compute"\nfile = "x"\nextra = 1\n',
        '[[class]]\nname = "Bad Name"\npriority = 1\n',
        '[[class]]\nname = "other"\npriority = 1\n',
        '[[role]]\nname = "boss"\nfile = "x"\n',
        "[colours]\n",
        "not toml [",
    ],
)
def test_a_bad_site_table_is_refused_with_its_name(tmp_path, text: str) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site.toml"
    site.write_text(text)
    with pytest.raises(TableError, match=r"site\.toml"):
        load_table(str(site))


def test_fallbacks_exist_in_any_table() -> None:
    table = parse_table([("t", {})])
    assert table.classes == (SLEEP_IDLE, OTHER)
