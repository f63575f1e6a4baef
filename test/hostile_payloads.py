"""A pickle that runs code when loaded: what a crafted checkpoint file would carry."""
import pickle


class HostilePickle:
    """Unpickling this creates the marker file (a stand-in for any code)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def hostile_bytes(marker) -> bytes:
    return pickle.dumps({"trainer": HostilePickle(marker)})
