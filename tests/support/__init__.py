"""What every test folder shares (``tests/`` is on ``sys.path``: ``from support.waits import wait_until``).

* :mod:`support.brokers`: the test brokers. The RabbitMQ URL (``OJS_AMQP_URL``), defined here
  once, and everything derived from it (host, port, vhost URLs); the brokers the shared suites
  run on (``OJS_TEST_BROKERS``); the running test's broker (:func:`~support.brokers.current_url`);
  and the guard that keeps tests not marked ``broker`` away from RabbitMQ and ``rabbitmqctl``.
* :mod:`support.policies`: the recovery policies tests share (``FAST``).
* :mod:`support.waits`: bounded waits and counts: polling state no event reports, a queue's
  message count, whether a queue exists, and :class:`~support.waits.Seen` (things a handler saw).
* :mod:`support.cleanup`: :class:`~support.cleanup.Cleanup`, the queues a test made, deleted after it.
* :mod:`support.fixtures`: the one fixtures plugin (loaded by ``tests/conftest.py``): the async
  backends, the broker-URL fixtures and the ``broker`` / ``disruptive`` markers they apply.
"""
