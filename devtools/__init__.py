"""Developer tooling: the ``chatexport dev`` supervisor, its process group, the moto launcher, the demo
corpus loader, and the harness the tests and the benchmark share (the compose file's services as local
processes, broker clean-up). Nothing that runs in production imports it; the production image does not
carry it.
"""
