"""Model definitions on backend arrays. Installed as `rawpage.models`."""
