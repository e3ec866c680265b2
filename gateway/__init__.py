"""raylog.gateway"""
