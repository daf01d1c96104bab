"""Wire codecs: bytes ⇄ inferd types, no I/O. Shared by the server and the client."""
