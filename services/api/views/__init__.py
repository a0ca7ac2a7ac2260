"""Request handlers, one module per resource."""
