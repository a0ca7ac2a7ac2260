"""Completion callbacks (webhooks): where they may go, and how they are signed (docs/api.md:
Completion callbacks).
"""
