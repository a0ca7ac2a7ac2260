"""Each user's rate limits (docs/api.md: Rate limits): the policies the settings set, and the limiter that
counts polls and downloads across API processes.
"""
