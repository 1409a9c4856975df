"""polycast's version (the package re-exports it as ``polycast.__version__``; modules below
the API import it from here, not from the package, which imports the whole API)."""

__version__ = "0.1.0"
