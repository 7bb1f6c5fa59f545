"""Wire formats: request/response messages, JSON and binary codecs, and the status table."""
