"""The ``chatexport`` command: the entry point above the parts (``services``), the shared runtime library
(``shared``) and the developer tooling (``devtools``).
"""
