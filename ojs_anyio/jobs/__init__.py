"""The pure OJS job layer: envelope, retry policy, topology names and arguments.

Nothing here performs I/O; the AMQP producer and worker are built on these pieces.
"""
