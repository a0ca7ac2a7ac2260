"""The chatexport processes: api, relay, worker and janitor."""
