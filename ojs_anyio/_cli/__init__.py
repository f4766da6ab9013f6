"""The commands of ``ojs-anyio`` (the parser and ``main`` are in :mod:`ojs_anyio.cli`)."""
