"""All SQL of the API. Every function takes the caller's connection so that writes share a transaction."""
