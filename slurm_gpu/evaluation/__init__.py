"""Synthetic labelled traces and the scored evaluation of the diagnosis."""
