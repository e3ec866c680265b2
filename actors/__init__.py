"""raylog.actors"""
