"""The ``kvpop-compile`` command line.

Every mistake a user can make on it ends in one line on stderr naming the bad value and what is
allowed, and exit status 2: arguments are checked as they are parsed (before a model loads), and
the errors the library raises for bad input are printed, not traced back.
"""

from .parser import build_parser, main

__all__ = ["build_parser", "main"]
