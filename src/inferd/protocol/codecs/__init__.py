"""Every door's codec pair (see `base`): one module per door, pure, used by `server.inference_call`."""
