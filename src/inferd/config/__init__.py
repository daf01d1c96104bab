"""Model and server configuration: inferd's own types, parsed at the edge."""
