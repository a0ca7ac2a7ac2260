"""The export logic behind the views: the submit's outcomes, which file a download serves and how it streams, and
waiting for an operation to change.
"""
