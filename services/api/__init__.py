"""The HTTP API (aiohttp): message store, exports, operations, downloads and admin routes."""
