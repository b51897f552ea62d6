"""One module per CLI verb: plain values in, a typed result out; never prints."""
