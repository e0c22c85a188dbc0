"""What a schedule is: its model and statuses, parsing a request into one,
recurrence, retry policy, times, and the Kafka record it becomes. Pure: no
IO, no clock reads, no other room of the node."""
