"""Beat's net under an AsyncAPI request's task message: a request whose message went missing is sent again.

A request stored with a task message of its own leaves its API's unstarted set only when a
delivery takes it (`jobs/asyncapi/store.py`). Its message can still go missing: on a broker transport
whose messages Sluice cannot make, the API process that stored a request dies before sending its
task through Celery; a node is killed between taking the message off the queue and taking the
request, which leaves it in kombu's unacknowledged hash until Redis's visibility timeout (an
hour), or takes it along. Nothing else would ever run such a request: it would stay `in_queue`.

The queue hands its messages out oldest first, so the store answers the oldest unstarted requests
beyond as many as there are messages still on the queue (`AsyncRequestStore.unstarted`): their
messages have left it. A live node takes a request within moments of taking its message, so one
that stays unstarted for `grace_s` on every look is sent a new message, and again each `grace_s`
while it stays so. A message thought lost that was not costs nothing but itself: the request's
first delivery runs it, and any later one finds it ended or held by another and only acknowledges.
The set keeps an order, not message ids: a message gone from behind one still queued is seen once
the queue has handed out the older one, a little later, never missed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from foundation.api_kinds import ApiKind
from foundation.api_registry import RedisApiRegistry
from jobs.asyncapi.submit import send_request
from jobs.placement.asyncapi import async_queue
from jobs.services import Services
from jobs.transport.broker import queue_lists

from .lost_batches import LOST_GRACE_S

log = logging.getLogger(__name__)


class LostRequestWatch:
    """The step, with when each unstarted request was first seen so (beat runs one of these, in its process)."""

    def __init__(self, grace_s: float = LOST_GRACE_S) -> None:
        self.grace_s = grace_s
        self._seen: dict[tuple[str, str], float] = {}  # (api, request id) -> first seen unstarted, or last sent

    def look(self, apis: list[str], unstarted: Callable[[str], list[str]], send: Callable[[str, str], object],
             now: float) -> list[str]:
        """Send again the requests of `apis` found unstarted (`unstarted(api)`) on every look for
        `grace_s`; returns them as "<api>/<id>". A request not found on a look starts afresh."""
        found = [(api, request_id) for api in apis for request_id in unstarted(api)]
        self._seen = {key: self._seen.get(key, now) for key in found}
        sent = []
        for (api, request_id), since in self._seen.items():
            if now - since < self.grace_s:
                continue
            send(api, request_id)
            self._seen[(api, request_id)] = now
            sent.append(f"{api}/{request_id}")
        if sent:
            log.warning("async requests in queue for %.0fs or more whose task message left their queue with no node "
                        "taking them (a node died while taking it, or the process submitting them before sending "
                        "it): sent again: %s", self.grace_s, sent)
        return sent

    def __call__(self, services: Services, now: float) -> list[str]:
        apis = [api.name for api in RedisApiRegistry(services.redis).all() if api.kind == ApiKind.ASYNC]
        with services.celery.connection_for_write() as conn:
            channel = conn.default_channel
            lists = {api: queue_lists(channel, async_queue(api)) for api in apis}
        return self.look(apis, lambda api: services.async_requests.unstarted(api, lists[api]),
                         lambda api, request_id: send_request(services.celery, api, request_id), now)
