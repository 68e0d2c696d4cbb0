"""Classes that must not load as policies (psgate check-policy exits 2, one line)."""

from psgate.policy import API_VERSION, Decision, EvictionPolicy


class NotAPolicy:
    name = "not-a-policy"
    api_version = 1


class _Fifo(EvictionPolicy):
    api_version = 1

    def on_free(self, blocks, now_ns):
        pass

    def on_touch(self, block):
        pass

    def select_victim(self, req, now_ns):
        return Decision(victim=0, num_candidates=0, position=0)

    def on_evict(self, block):
        pass

    @property
    def num_candidates(self):
        return 0


class FromTheFuture(_Fifo):
    name = "from-the-future"
    api_version = API_VERSION + 1


class Nameless(_Fifo):
    name = ""


class RefusesToBuild(_Fifo):
    name = "refuses-to-build"

    def __init__(self, **params):
        super().__init__(**params)
        raise RuntimeError("no GPU here")
