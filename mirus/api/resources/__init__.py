"""The REST API's resources, one module each as in Kafka Connect's `rest/resources/`: connectors, their tasks,
offsets and operator partition pauses, the connector plug-ins and their validation, the admin loggers, and the root
(version probe and metrics). `mirus.api.app` routes requests to them."""
