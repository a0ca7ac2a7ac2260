"""HTTP plumbing of the API: the server, middlewares, request bodies and header fields, problems, responses,
pagination, connection slots, the routes' contract (pydantic schemas, endpoints, the OpenAPI document),
application keys and metrics.
"""
