"""Completion callbacks (webhooks): where they may go, and how they are signed (README: API reference,
Completion callbacks).
"""
