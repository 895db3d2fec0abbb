"""Argument types shared by the ``ringtrain data`` subcommands (argparse ``type=`` callables)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer greater than 0; argparse reports anything else as a bad flag."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of 0 or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value
