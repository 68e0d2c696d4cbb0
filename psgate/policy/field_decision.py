"""A Decision held as the numbers and names that make it, built per victim in a policy's
own loop without its dicts.

A policy that takes a batch of victims in one pass (lru's ``evict_batch``) records one
decision per victim; most of them are only written to the ledger. A subclass of
:class:`FieldDecision` keeps the victim's fields as they are (a time in ns, a count), and
the compact ledger's coder writes its row from them. To any other reader it is the
:class:`~psgate.policy.Decision` it stands for: the same attributes (the dicts made on
first read, then kept), equal to it, and ``decision()`` makes it.

This module is written in Cython's pure-Python mode: ``pip install`` compiles it
(``field_decision.pxd`` declares the fields), and without a compiler it runs as written.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython


@cython.cclass
class FieldDecision:
    """The fields every decision has: the victim and the candidates there were.
    A subclass says what else it holds and which Decision it is (``decision()``)."""

    __hash__ = None                     # as the Decision dataclass's (eq, not frozen)
    position = 0

    @property
    def num_candidates(self):
        return self.num_cand

    def decision(self):
        """The Decision this stands for."""
        raise NotImplementedError

    def __eq__(self, other):
        if isinstance(other, FieldDecision):
            other = other.decision()
        return self.decision() == other

    def __repr__(self):
        return repr(self.decision())
