"""CLI verbs, one module per stage. Each module defines ``register(app)`` and keeps heavy imports inside
the command functions so that ``fideval --help`` stays instant."""
