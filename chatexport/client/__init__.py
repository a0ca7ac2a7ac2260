"""The command-line client of the chatexport API: HTTP only, no server code (docs/command-line.md: Command-line
client)."""
