"""A partition revoked and assigned again within one poll (an eager rebalance of the
agents' group, the last member rejoining) keeps the finished offsets loaded at its
assignment: the loop used to drop them with the revocation it handled after the poll, and
every delivery finished above the committed offset was sent again."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from streams.agent import Rebalances


def test_a_revoke_and_an_assign_in_one_poll_keep_the_new_finished_set() -> None:
    moves = Rebalances()
    moves.assign({("dispatch.v1", 0): {5, 6}, ("dispatch.v1", 1): {9}})
    assert moves.settle() == (set(), True)
    assert moves.skip == {("dispatch.v1", 0): {5, 6}, ("dispatch.v1", 1): {9}}
    moves.skip[("dispatch.v1", 0)].discard(5)  # its record came again: skipped once

    # one poll: both revoked, partition 0 assigned back (its committed state reloaded)
    moves.revoke([TopicPartition("dispatch.v1", 0), TopicPartition("dispatch.v1", 1)])
    moves.assign({("dispatch.v1", 0): {6, 7}})
    gone, came = moves.settle()
    assert gone == {("dispatch.v1", 0), ("dispatch.v1", 1)} and came
    assert moves.skip == {("dispatch.v1", 0): {6, 7}}  # partition 1's went with it

    assert moves.settle() == (set(), False)  # nothing new since
    assert moves.skip == {("dispatch.v1", 0): {6, 7}}
