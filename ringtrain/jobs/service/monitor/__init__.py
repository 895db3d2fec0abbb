"""What the dashboard shows beyond the records: training scalars, node usage, service metrics."""
