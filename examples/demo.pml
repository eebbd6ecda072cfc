<schema name="demo">
  <system>You are a concise assistant. Answer from the document.</system>
  <user>
    <union name="document">
      <module name="observatory">The Lindqvist Observatory stands on Harrow Ridge, 2,140 metres above the village of Vell.
It was founded in 1931 by the astronomer Maja Lindqvist, who paid for the first dome by selling her
family's timber mill. The original instrument was a 60-centimetre reflecting telescope ground by hand
over four winters. In 1978 a second dome was added for a 1.8-metre telescope, which is still the largest
in the region. The observatory is best known for the Vell Survey, a catalogue of 41,000 variable stars
completed in 1994 after twenty-two years of observations. Because the ridge is often above the clouds,
the staff measured 290 clear nights per year during the survey. Visitors can reach the observatory by a
cable car that runs from Vell every forty minutes between May and October; in winter the road is closed
and staff travel by snow tractor. The current director, Tomas Ekberg, started a programme in 2015 that
lets school classes control the small telescope over the internet. The observatory's library keeps
Lindqvist's notebooks, which record the weather every night from 1931 until her death in 1969.
The Vell Survey data are still used today to calibrate automated sky surveys.</module>
      <module name="harbor">Calder Bay is a fishing town on a sheltered inlet of the northern coast, home to about 6,300 people.
Its harbour was dug out by hand in 1846 after a storm destroyed the older wooden pier, and the granite
breakwater built then still protects the fleet. The town's main catch is mackerel in summer and crab in
autumn; the crab season opens every year on the second Monday of September with the Blessing of the
Boats. The red lighthouse at the end of the breakwater, called the Calder Light, was automated in 1987;
its last keeper, Agnes Moir, kept the light for thirty-one years. A ferry leaves Calder Bay for the
island of Skerra twice a day and takes fifty-five minutes. The town museum, in the old salt store,
displays a 9-metre rowing lifeboat named Endeavour that saved forty-seven sailors between 1880 and
1921. Calder Bay is also known for smoked mackerel pâté, made to a recipe from the Moir family, and for
the Harbour Regatta, a race of traditional sailing boats held on the last Saturday of July. The tide in
the inlet can rise by more than five metres, so boats are moored on long chains.</module>
      <module name="railway">The Meridian Line is a narrow-gauge railway that climbs 38 kilometres from the market town of Oster
to the lakeside resort of Brannholm. Construction began in 1902 and took seven years, because the line
needed eleven tunnels and the stone viaduct at Kessel Gorge, which is 212 metres long and 64 metres high.
Steam locomotives ran the line until 1956, when it was electrified; two of the original engines, numbers
4 and 7, have been restored and pull heritage trains on summer Sundays. A regular train takes one hour
and forty minutes from Oster to Brannholm and stops at nine stations. The steepest section, near the
village of Grauwald, has a gradient of seven percent and uses a rack rail between the running rails.
In 1999 a landslide closed the line for fourteen months; it reopened with a new avalanche gallery above
the Grauwald tunnel. The line carries about 400,000 passengers a year, most of them hikers and skiers.
Season tickets for residents of the valley cost forty euros, and bicycles travel free in the last
carriage. The railway's workshop in Oster still builds replacement parts for the old steam engines.</module>
    </union>
    <module name="style">Answer in a <param name="tone" len="6"/> tone.</module>
  </user>
</schema>
