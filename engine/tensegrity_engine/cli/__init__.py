"""Command-line programs (``tensegrity-identify``, ``tensegrity-control``,
``tensegrity-demo``): argument parsing over the packages. Nothing imports them but benches."""
