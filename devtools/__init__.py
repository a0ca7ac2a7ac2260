"""Developer tooling: the ``chatexport dev`` supervisor, its process group, the moto launcher and the demo
corpus loader. Nothing that runs in production imports it; the production image does not carry it.
"""
