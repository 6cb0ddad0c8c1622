"""Bounds on the accounting strings that a job's owner chose (name, comment, working
directory), shared by both accounting backends. The strings are cleaned with
``slurm_gpu.textsafe.clean_user_text`` where they enter, to at most these lengths (characters).
"""

from __future__ import annotations

#: ``JobName``: Slurm keeps more, but no report shows more than a line.
JOB_NAME_MAX_LEN = 256
#: ``Comment``.
COMMENT_MAX_LEN = 1024
#: ``WorkDir``: Linux's PATH_MAX.
WORK_DIR_MAX_LEN = 4096
#: ``SubmitLine``: the command line the job was submitted with (its request options).
SUBMIT_LINE_MAX_LEN = 4096
