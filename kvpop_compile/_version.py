"""The library's version, in a module of its own: the modules that record it (saved scorers,
engine manifests, benchmark reports) import it from here, not from the package's front file,
which loads every part of the library."""

__version__ = "0.1.0"
