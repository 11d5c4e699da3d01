"""What every shell needs to serve HTTP to clients it does not trust: a cap on the
connections held, per client too, and deadlines for reading and answering."""
