"""Exception hierarchy. Every error names the bad value, what was expected and how to fix it."""

from __future__ import annotations


class BenchmarkError(Exception):
    """Base of every error bt-bench raises on purpose (the CLI prints these without a trace)."""


class InputFileError(BenchmarkError):
    """An input file is missing, unreadable or malformed."""


class MetricInputError(BenchmarkError, ValueError):
    """Arguments to a metric have the wrong shape, are empty, or are inconsistent."""


class ReleaseError(BenchmarkError):
    """A release folder is missing, has the wrong schema, or fails its checksums."""


class BuildError(BenchmarkError):
    """A build failed, including a failed emergence gate."""


class UnsafeFileError(InputFileError):
    """A stored file holds something bt-bench will not load.

    A pickled object (code), an object array, or a file of the wrong form; the message names
    the file and the fix.
    """


class InputLimitError(InputFileError):
    """An untrusted input exceeds a parsing limit (size, nesting depth, number length, count)."""


class CacheRootError(BenchmarkError):
    """The cache folder is owned by another user or writable by others.

    Others could plant entries there that bt-bench would trust.
    """
