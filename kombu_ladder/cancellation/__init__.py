"""Cancellations: the records of ``ladder.cancellations`` (:mod:`.records`, pure) and writing them (:mod:`.stream`).

A relay reads them with :class:`~kombu_ladder.relay.cancelwatch.CancelWatch`.
"""
