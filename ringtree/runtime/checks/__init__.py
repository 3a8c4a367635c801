"""What a call settles with the other ranks before it runs: the comparison of its arguments
(agreement) and a refusal every rank hears (refusal). Imports every other room of the runtime."""
