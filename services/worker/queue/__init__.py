"""The worker's side of the broker: consuming a queue's wake-ups (``consumer``) and checking that its quorum
queues have their replicas (``members``)."""
