"""LLAA: the lazy live-and-archived algorithm (001 section 4.2, Algorithm 2).

Live drives: each live instance ``I``, as soon as it completes, makes one archive request for its
access range ``R_A(I)`` (and its key, when the JOIN gives one), ``P_A`` is matched over what came
back, and ``I`` is joined with every archived instance found. No delay in event time; one request
per live instance, and overlapping ranges are read and matched again for every instance:

    Cost_LLAA = |W_L| Cost_L + N_InstL Cost_RDB + sum_i Cost_A |R_Ai| + Cost_join N_P      (001 eq. 2)
"""
from __future__ import annotations

from engine.live_archived.base import LiveInstance, Runner
from engine.live_archived.plan import NO_KEY
from engine.match import Match


class LLAA(Runner):
    """One archive request per completed live instance (see the module docstring)."""

    algorithm = "llaa"

    def on_instances(self, insts: list[LiveInstance]) -> list[Match]:
        out: list[Match] = []
        for inst in insts:
            if self.plan.key_of(inst.match) is NO_KEY:
                self.answered([inst])  # the key equality cannot hold: nothing to ask, no result
                continue
            out += self.submit([inst], self.answer_one)
        return out

    def answer_one(self, insts: list[LiveInstance]) -> list[Match]:
        """Request ``R_A(I)`` for the one instance ``I`` of ``insts``, match ``P_A`` over it, join ``I``."""
        [inst] = insts
        key = self.plan.key_of(inst.match)
        if self.known_ranges is not None:  # only what no earlier request of the key read
            request = {key: [self.access(inst)]}
            joined: list[list[Match]] = [[]]
            if self.join_known(request, [(0, inst, key, self.access(inst))], joined):
                return joined[0]
            found = self.archived_in(request, logical=False)[key]
        else:
            keys = None if self.plan.key is None else [key]
            found = self.match_archived(self.request(keys, [self.access(inst)]))
        out: list[Match] = []
        with self.lock:
            self.join(inst, found, out)
        return out
