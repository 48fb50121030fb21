-- What a rebuild would clear of consumer $1's inbox: every row it keeps,
-- whatever the aggregate (the inbox keeps no aggregate type).
SELECT count(*) FROM relaybus_inbox WHERE consumer_id = $1
