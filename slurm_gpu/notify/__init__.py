"""The e-mail after a job: message building, transports, digests and site policy."""
