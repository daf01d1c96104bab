"""The `inferd` command line: one thin command per module."""
