"""The outbox relay: publishes outbox rows to RabbitMQ with publisher confirms."""
