"""The HTTP edge: ``app`` (middlewares, errors as HTTP), the routes
(``schedules``, ``cluster``), ``auth``, ``views`` of stored documents, the
OpenAPI document, and ``context``, the Protocol the routes use instead of the
node itself."""
