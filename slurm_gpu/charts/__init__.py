"""PNG charts for the e-mail (matplotlib, Agg). Import only on the mail path."""
