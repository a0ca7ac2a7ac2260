"""Code shared by the chatexport parts: settings, database, broker, storage, auth, the operation model."""
