"""Invariant checkers: verdicts computed from engine events, never from a policy's word.

``checker`` holds the hard invariants every engine checks; ``prefixshield`` the PrefixShield
family's own (I1, I2), which those policies hand the engine. They import nothing from psgate
but each other, so both the engines and the policies can build on them.
"""
