"""The chaos matrix (issue 11): randomized fault trials against real processes, each checked
against the runtime's invariants. ``python -m tests.chaos`` runs the matrix (``make chaos``);
``tests/chaos/test_chaos.py`` runs a reduced form in the normal test suite. See
``docs/reliability.md``."""
