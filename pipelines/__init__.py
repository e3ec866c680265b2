"""raylog.pipelines"""
