"""The command-line client of the chatexport API: HTTP only, no server code (README: Command-line client)."""
