"""The janitor: scheduled expiry, purging, re-enqueueing and clean-up passes."""
